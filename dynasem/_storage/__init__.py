"""The storage layer: every DynamoDB request dynasem makes and the stored format, a module
per item kind (see docs/ARCHITECTURE.md). Nothing is re-exported here: import the module that
defines a name."""
