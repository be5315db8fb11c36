"""What every entry point shares and no layer owns: flags and DSNs, masking secrets,
database error classes, logging, durations and ranges, text for people, waiting."""
