# Cloud SQL for PostgreSQL 16, regional HA with point-in-time recovery (NFR-05, INV-04 runbook in
# docs/deploy-gcp.md). Private IP only; IAM database authentication, so no password exists.
# Every connection goes through the Cloud SQL Auth Proxy (each database pod's sidecar): TLS 1.3
# with an ephemeral client certificate per IAM identity, the server's identity checked against
# the instance's CA, which the proxy fetches itself (docs/deploy-gcp.md, "TLS"). The instance
# refuses everything else: connector_enforcement (no direct connection at all) and ssl_mode (a
# direct one, were it allowed, would need TLS and a trusted client certificate).
resource "google_sql_database_instance" "paydb" {
  # checkov:skip=CKV_GCP_6: TLS is enforced: connector_enforcement = REQUIRED (Auth Proxy only) and ssl_mode TRUSTED_CLIENT_CERTIFICATE_REQUIRED below.
  # checkov:skip=CKV_GCP_79: PostgreSQL 16 is the major version the project tests against (pgserver ships 16).
  # checkov:skip=CKV2_GCP_20: The instance has no public IP (ipv4_enabled = false); the check wants ssl too, which ssl_mode covers.
  name                = "payouts-dev"
  database_version    = "POSTGRES_16"
  region              = var.region
  deletion_protection = false # NFR-14: destroy leaves nothing billable; PITR backups go with it

  settings {
    tier              = "db-custom-1-3840"
    edition           = "ENTERPRISE"
    availability_type = "REGIONAL"
    # Only the Cloud SQL Auth Proxy and the Cloud SQL connectors may connect (TLS 1.3, IAM).
    connector_enforcement = "REQUIRED"
    disk_autoresize   = true
    user_labels       = { env = "dev", app = "payouts" }

    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
      start_time                     = "02:00"
      transaction_log_retention_days = 7
      backup_retention_settings {
        retained_backups = 7
      }
    }
    ip_configuration {
      ipv4_enabled    = false
      private_network = google_compute_network.vpc.id
      ssl_mode        = "TRUSTED_CLIENT_CERTIFICATE_REQUIRED"
    }
    database_flags {
      name  = "cloudsql.iam_authentication"
      value = "on"
    }
    database_flags {
      name  = "log_checkpoints"
      value = "on"
    }
    database_flags {
      name  = "log_connections"
      value = "on"
    }
    database_flags {
      name  = "log_disconnections"
      value = "on"
    }
    database_flags {
      name  = "log_lock_waits"
      value = "on"
    }
    database_flags {
      name  = "log_min_messages"
      value = "error"
    }
    database_flags {
      name  = "log_temp_files"
      value = "0"
    }
    database_flags {
      name  = "log_min_duration_statement"
      value = "-1"
    }
    database_flags {
      name  = "log_min_error_statement"
      value = "error"
    }
    database_flags {
      name  = "log_hostname"
      value = "on"
    }
    database_flags {
      name  = "log_statement"
      value = "ddl"
    }
    database_flags {
      name  = "log_duration"
      value = "on"
    }
    database_flags {
      name  = "cloudsql.enable_pgaudit"
      value = "on"
    }
    database_flags {
      name  = "pgaudit.log"
      value = "ddl,role"
    }
  }
  depends_on = [google_billing_budget.dev, google_service_networking_connection.sql]
}

resource "google_sql_database" "payouts" {
  name       = "payouts"
  instance   = google_sql_database_instance.paydb.name
  depends_on = [google_billing_budget.dev]
}

# One IAM database user per workload that connects (its Google service account, no password).
resource "google_sql_user" "workload" {
  for_each   = { for k, v in local.workloads : k => v if v.database }
  name       = trimsuffix(google_service_account.workload[each.key].email, ".gserviceaccount.com")
  instance   = google_sql_database_instance.paydb.name
  type       = "CLOUD_IAM_SERVICE_ACCOUNT"
  depends_on = [google_billing_budget.dev]
}
