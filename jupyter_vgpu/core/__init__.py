"""The pure core: wire contract, topology and placement. No I/O, no third-party imports."""
