"""Search strategies (each a module with one ``tune(...)`` entry) and the two-tier driver."""
