"""The store conformance suite: the same relay and staging behaviours on every store."""
