"""Storage: every path a user gives (local, gs://, s3://), the clients behind
buckets, whole writes, local copies of objects. Imports nothing of elmo-jax's
but `errors` and `environment`."""
