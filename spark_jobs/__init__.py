"""spark-submit applications (thin wrappers around tridentflow; no Airflow imports)."""
