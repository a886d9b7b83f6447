"""Find, snapshot and keep track of dropped objects: what is new, its immutable copy, and the
invariant that nothing dropped falls through."""
