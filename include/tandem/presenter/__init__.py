"""The presenter (the seeds' presenter node, inside Airflow): Tandem's page in the Airflow UI and its REST API.

``views`` reads what is shown (PostgreSQL, Delta); ``models`` are the JSON shapes; ``api`` is the
FastAPI app the ``tandem_ui`` plugin mounts, with Airflow's authentication; ``page.html`` is the page.
"""
