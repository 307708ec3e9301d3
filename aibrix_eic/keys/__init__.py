"""What a key says: AIBrix key to EIC key string, and the model identity in it."""
