-- The database PostgresSinks write to (AIRFLOW_CONN_POSTGRES_DEFAULT), apart from Airflow's.
CREATE DATABASE tridentflow OWNER airflow;
