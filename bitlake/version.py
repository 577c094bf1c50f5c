"""The package's version, which commits name as their writer's (``bitlake.transaction.engine``)."""

__version__ = "0.1.0"
