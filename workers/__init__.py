"""vramlab's worker: claims experiments over HTTP and runs each in a clean child process."""
