"""What the suites share: the goal record, settings, clusters and our application as deployed,
client-side load, process CPU, the corpus, the PyTorch baseline and the fake model handles."""
