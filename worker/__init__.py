"""outbox-worker: leases outbox rows, publishes them, finalizes fenced on lease_version."""
