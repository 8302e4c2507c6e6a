# Secret containers only: their values are added out of band (docs/deploy-gcp.md,
# `gcloud secrets versions add`), so no secret value is ever in the Terraform state (NFR-12).
resource "google_secret_manager_secret" "grant" {
  # checkov:skip=CKV_GCP_125: Google-managed encryption keys; a CMEK would outlive destroy (NFR-14).
  for_each  = toset(["grant-signing-key", "grant-public-key"])
  secret_id = each.value
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  labels     = { env = "dev", app = "payouts" }
  depends_on = [google_billing_budget.dev, google_project_service.apis]
}
