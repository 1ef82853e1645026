"""Placement policies: one interface (`base.PlacementPolicy`), one registry, one module per policy."""
