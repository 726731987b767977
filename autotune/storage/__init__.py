"""Where tuned plans persist: Optuna storage (SQLite by default, any RDB URL), keyed by a
fingerprint of the job and the cluster, with the tables and priors saved beside the studies.
"""
