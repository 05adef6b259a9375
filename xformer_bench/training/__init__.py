"""Lightning plumbing shared by every task: trainer, callbacks, timing."""
