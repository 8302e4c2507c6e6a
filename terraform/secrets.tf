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

# The deployment's TLS CA (deploy/k8s_tls.py; docs/deploy-gcp.md, "TLS"): its private key and,
# beside it, its certificate (public, kept here so that the operator who issues a certificate
# fetches the pair from one versioned place). Containers only, like the grant-signing key. No
# workload is granted either (iam.tf): the cluster gets the CA's certificate through ConfigMap
# payouts-ca and each server's key through its own Kubernetes Secret.
resource "google_secret_manager_secret" "tls_ca" {
  # checkov:skip=CKV_GCP_125: Google-managed encryption keys; a CMEK would outlive destroy (NFR-14).
  for_each  = toset(["tls-ca-key", "tls-ca-cert"])
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
