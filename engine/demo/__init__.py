"""tandem's built-in example: a hybrid Python + JVM service recorded and analyzed by `tandem demo`."""
