"""Hidden-state drafting heads (MTP, EAGLE-3): the contract in base.py."""
