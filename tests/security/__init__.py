"""Red-team tests of the local backend: attacks an adversarial agent would try, asserted from the host side."""
