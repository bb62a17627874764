"""Tandem for the monitoring stack on-call teams run: the plane's metrics in Prometheus' exposition format
(``tandem exporter``), the names they carry, and the words of quarantine reasons as bounded label values."""
