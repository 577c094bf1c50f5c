"""The key store's fast paths: the RocksDB key index, the in-memory key cache, key encoding."""
