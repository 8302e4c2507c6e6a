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

# Bearer tokens (one per component identity) and the servers' credentials files
# (common.credentials): containers only, like the keys above. Each workload may read only its own
# (local.workloads in iam.tf) and its SecretProviderClass mounts only those (deploy/k8s).
resource "google_secret_manager_secret" "credential" {
  # checkov:skip=CKV_GCP_125: Google-managed encryption keys; a CMEK would outlive destroy (NFR-14).
  for_each = toset([
    "lock-server-credentials", "railstub-credentials", "railproxy-credentials",
    "finledger-credentials", "railproxy-token", "outbox-token", "worker-token",
    "reconciler-token", "invariants-token",
  ])
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

# The private key of the deployment's TLS CA (deploy/k8s_tls.py; docs/deploy-gcp.md, "TLS"): a
# container only, like the grant-signing key. No workload is granted it (iam.tf): only the
# operator who issues or rotates a certificate reads it; the CA's certificate is public
# (ConfigMap payouts-ca) and the servers' keys are Kubernetes Secrets.
resource "google_secret_manager_secret" "tls_ca_key" {
  # checkov:skip=CKV_GCP_125: Google-managed encryption keys; a CMEK would outlive destroy (NFR-14).
  secret_id = "tls-ca-key"
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
