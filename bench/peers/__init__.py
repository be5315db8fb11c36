"""Peers measured beside outbox-dispatcher, each run as its own worker process."""
