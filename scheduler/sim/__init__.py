"""The simulator: a discrete-step engine model that runs the policy core on a calibrated cost model."""
