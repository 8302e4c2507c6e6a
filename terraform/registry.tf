resource "google_artifact_registry_repository" "images" {
  # checkov:skip=CKV_GCP_84: Google-managed encryption keys suffice for a dev image repository; a CMEK would outlive destroy (NFR-14).
  location      = var.region
  repository_id = "payouts"
  format        = "DOCKER"
  description   = "fenced-payouts images, pulled by digest"
  docker_config {
    immutable_tags = true
  }
  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 10
    }
  }
  depends_on = [google_billing_budget.dev, google_project_service.apis]
}
