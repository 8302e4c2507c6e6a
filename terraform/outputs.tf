output "cluster" {
  value = google_container_cluster.dev.name
}

output "cloudsql_instance" {
  description = "CLOUDSQL_INSTANCE of deploy/k8s/01-config.yaml"
  value       = google_sql_database_instance.paydb.connection_name
}

output "image_repository" {
  value = "${var.region}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.images.repository_id}"
}

output "database_role_grants" {
  description = "The one-time GRANTs of docs/deploy-gcp.md: each workload's IAM user joins its payouts_* role(s)"
  value = flatten([
    for k, v in local.workloads : [
      for r in v.db_roles :
      "GRANT ${r} TO \"${trimsuffix(google_service_account.workload[k].email, ".gserviceaccount.com")}\";"
    ]
  ])
}
