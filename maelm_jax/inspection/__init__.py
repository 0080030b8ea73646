"""A trained model looked at: checkpoint loading, fill-in samples, representation rank."""
