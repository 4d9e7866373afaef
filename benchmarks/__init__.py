"""The benchmark suite behind ``aotune bench``."""
