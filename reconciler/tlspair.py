"""A self-signed TLS pair for the front (api.tls without files of yours), made like the API key:
once, on the machine running the reconciler, then written to the head (the key 0600).

ECDSA P-256: what every TLS client takes, and small; the certificate names the addresses and
host names the API is reached by, so clients that pin it also check the name.
"""

from __future__ import annotations

import datetime
import ipaddress


def self_signed(names: list[str], days: int) -> tuple[str, str]:
    """(private key PEM, certificate PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else "spark-reconciler")])
    now = datetime.datetime.now(datetime.UTC)
    alternatives: list[x509.GeneralName] = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM).decode()
