"""Child processes the fault tests start and kill -9: each prints where it is, for the test to wait on."""
