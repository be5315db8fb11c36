"""One module per screen: dashboard, dead letters (list and error groups), message
detail, the audit log, and the confirm and help dialogs."""
