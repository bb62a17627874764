# Tandem on the official Airflow image: Airflow 3.3.2 (Python 3.11) + Java 17 for PySpark 4.2 +
# the pinned requirements + the tandem package, DAGs, plugins, jobs and conf.
#
#   docker build -t tandem:latest .
#   docker run --rm -p 8080:8080 --env-file tandem.env tandem:latest standalone
#
# tandem.env (mode 0600) holds TANDEM_DATABASE_URL and AIRFLOW__DATABASE__SQL_ALCHEMY_CONN: URLs with
# passwords never go on a command line (README, "Docker").
#
# The pins in constraints.txt match the image's Airflow (apache-airflow==3.3.2), so pip does not
# re-resolve Airflow itself. The base image is pinned to an exact release tag; where a registry is
# reachable, pin its digest as well: FROM apache/airflow:3.3.2-python3.11@sha256:<digest>
# (docker buildx imagetools inspect apache/airflow:3.3.2-python3.11).
FROM apache/airflow:3.3.2-python3.11

# Java for Spark; JAVA_HOME is a symlink, so it is the same on amd64 and arm64. The Debian package
# can be overridden (e.g. a Temurin package) should the base image move to a Debian release
# without openjdk-17.
ARG JAVA_PACKAGE=openjdk-17-jre-headless

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends "${JAVA_PACKAGE}" procps \
 && apt-get autoremove -yqq --purge \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sfn "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/tandem-java \
 && /usr/lib/jvm/tandem-java/bin/java -version 2>&1 | grep -q 'version "17' \
 && mkdir -p /opt/tandem && chown airflow:0 /opt/tandem
ENV JAVA_HOME=/usr/lib/jvm/tandem-java

USER airflow
WORKDIR /opt/tandem

# Dependencies first (cached layer while only the code changes).
COPY --chown=airflow:0 requirements.txt constraints.txt ./
# pip and setuptools first, pinned in constraints.txt (as scripts/setup.sh does for .venv)
RUN pip install --no-cache-dir $(grep -E '^(pip|setuptools)==' constraints.txt) \
 && pip install --no-cache-dir -r requirements.txt -c constraints.txt

# Spark class-data sharing (README, set-up step 7): one small Spark job records the classes a driver loads into an
# archive that every driver of the image then maps instead of loading them again (a driver's start and first query:
# 14-15 s without, 9 s with, on the development machine). It depends on the JDK and pyspark only, hence this layer.
COPY --chown=airflow:0 scripts/spark_cds_training.py scripts/
RUN SPARK_SUBMIT_OPTS="-XX:ArchiveClassesAtExit=/opt/tandem/spark-cds.jsa" \
        spark-submit --master 'local[1]' scripts/spark_cds_training.py \
 && SPARK_SUBMIT_OPTS="-XX:SharedArchiveFile=/opt/tandem/spark-cds.jsa" \
        spark-submit --master 'local[1]' scripts/spark_cds_training.py

# The project. `pip install --no-deps .` installs package `tandem` (from include/) and the
# `tandem` console script; the source tree stays in /opt/tandem for dags/, plugins/, jobs/, conf/.
COPY --chown=airflow:0 pyproject.toml README.md ./
COPY --chown=airflow:0 include/ include/
COPY --chown=airflow:0 dags/ dags/
COPY --chown=airflow:0 plugins/ plugins/
COPY --chown=airflow:0 jobs/ jobs/
COPY --chown=airflow:0 conf/ conf/
RUN pip install --no-cache-dir --no-deps . \
 && python -c "import tandem" \
 && python -m tandem.packaging --spark-zips \
 && PYTHONPATH=include python -m tandem.packaging /opt/tandem

ENV TANDEM_HOME=/opt/tandem \
    TANDEM_STORAGE_ROOT=/opt/tandem/data \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/tandem/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/tandem/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    AIRFLOW__CORE__EXECUTOR=LocalExecutor \
    AIRFLOW__EDGE__API_RETRIES=100000 \
    AIRFLOW__EDGE__API_RETRY_WAIT_MAX=10 \
    AIRFLOW__API_AUTH__JWT_LEEWAY=120 \
    PYSPARK_PYTHON=python \
    PYSPARK_DRIVER_PYTHON=python \
    SPARK_SUBMIT_OPTS=-XX:SharedArchiveFile=/opt/tandem/spark-cds.jsa
