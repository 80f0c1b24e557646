"""Engine adapters: one per inference engine, all speaking the protocol in base.py."""
