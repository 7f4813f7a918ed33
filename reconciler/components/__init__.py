"""Desired vs observed, one module per thing we manage; each returns actions with causes."""
