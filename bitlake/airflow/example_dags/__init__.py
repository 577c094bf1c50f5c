"""Example DAGs of bitlake's Airflow provider; copy one into your DAGs folder to use it."""
