"""spark-reconciler: a declarative operator for DeepSeek-V4.1-Flash on DGX Spark nodes.

The package follows one loop: spec (desired) -> facts (observed) -> plan (pure diff)
-> apply (act) -> facts again. Each box is a module or package of its own.
"""

__version__ = "0.1.0"
