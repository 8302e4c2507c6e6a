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
