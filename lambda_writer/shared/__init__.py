"""What every function of the bundle shares: settings, connections, AWS clients, errors,
constants."""
