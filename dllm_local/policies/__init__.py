"""Cache and unmasking policies, each a small unit chosen by name (see ``registry``)."""
