#!/bin/bash
# The image's entry point, as Spark on Kubernetes calls it (the Spark operator's driver
# and executor pods; spark-submit --master k8s://...): `driver ARGS` runs spark-submit in
# client mode inside the driver pod, `executor` starts an executor backend from the
# environment Spark sets on its pods; anything else runs as it is (`shorelink-spark
# site ...` for a driver in a pod of its own, `shorelink-spark --help`).
set -eu
case "${1:-}" in
  driver)
    shift
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS:-}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # SPARK_JAVA_OPT_0, _1, ...: the executor's Java options, in order
    mapfile -t opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    exec java "${opts[@]}" -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "$SPARK_HOME/jars/*:${SPARK_CLASSPATH:-}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-}" "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
