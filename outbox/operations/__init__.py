"""What people do to a table: requeue and skip, replay and reconcile, pause and resume a
destination, retention and partition upkeep, each recorded where it changes rows."""
