"""The composed family: several approximations in one variant."""
