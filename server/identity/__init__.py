"""Identity condensation: a shorter persona made by the served model from successful traces, accepted
only if it answers the caller's tests as the full one does."""
