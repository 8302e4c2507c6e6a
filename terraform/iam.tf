# Least privilege (NFR-13): one Google service account per workload, bound by Workload Identity
# to its Kubernetes service account, with only the roles listed here. The inventory table in
# docs/deploy-gcp.md is checked against this map by tests/deploy.
locals {
  # db_roles: the payouts_* roles of the migrations (common/db_roles.py) granted, once, to the
  # workload's Cloud SQL IAM user (docs/deploy-gcp.md, "Database roles"). The migrator is the
  # admin: it creates those roles and owns the schemas, and is a member of none of them.
  workloads = {
    lock       = { ksa = "lock-server", database = true, db_roles = ["payouts_lockservice"], secrets = ["grant-signing-key", "lock-server-credentials"] }
    railproxy  = { ksa = "railproxy", database = true, db_roles = ["payouts_railproxy"], secrets = ["grant-public-key", "railproxy-credentials", "railproxy-token"] }
    worker     = { ksa = "worker", database = true, db_roles = ["payouts_paydb", "payouts_reconciler"], secrets = ["grant-public-key", "worker-token", "reconciler-token"] }
    outbox     = { ksa = "outbox", database = true, db_roles = ["payouts_outbox"], secrets = ["outbox-token"] }
    migrator   = { ksa = "migrator", database = true, db_roles = [], secrets = [] }
    reconciler = { ksa = "reconciler", database = true, db_roles = ["payouts_reconciler"], secrets = ["reconciler-token"] }
    checker    = { ksa = "checker", database = true, db_roles = ["payouts_checker"], secrets = ["invariants-token"] }
    railstub   = { ksa = "railstub", database = false, db_roles = [], secrets = ["railstub-credentials"] }
    finledger  = { ksa = "finledger", database = false, db_roles = [], secrets = ["finledger-credentials"] }
  }
  database_roles = ["roles/cloudsql.client", "roles/cloudsql.instanceUser"]
  node_roles = [
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/stackdriver.resourceMetadata.writer",
    "roles/artifactregistry.reader",
  ]
}

resource "google_service_account" "workload" {
  for_each     = local.workloads
  account_id   = "payouts-${each.key}"
  display_name = "payouts ${each.key} (KSA payouts/${each.value.ksa})"
  depends_on   = [google_project_service.apis]
}

resource "google_service_account" "nodes" {
  account_id   = "payouts-nodes"
  display_name = "payouts GKE nodes: logs, metrics, image pulls"
  depends_on   = [google_project_service.apis]
}

resource "google_project_iam_member" "nodes" {
  for_each = toset(local.node_roles)
  project  = var.project_id
  role     = each.value
  member   = "serviceAccount:${google_service_account.nodes.email}"
}

resource "google_service_account_iam_member" "workload_identity" {
  for_each           = local.workloads
  service_account_id = google_service_account.workload[each.key].name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[payouts/${each.value.ksa}]"
  depends_on         = [google_container_cluster.dev]
}

resource "google_project_iam_member" "database" {
  for_each = {
    for pair in setproduct([for k, v in local.workloads : k if v.database], local.database_roles) :
    "${pair[0]}/${pair[1]}" => { workload = pair[0], role = pair[1] }
  }
  project = var.project_id
  role    = each.value.role
  member  = "serviceAccount:${google_service_account.workload[each.value.workload].email}"
}

resource "google_secret_manager_secret_iam_member" "access" {
  for_each = {
    for pair in flatten([for k, v in local.workloads : [for s in v.secrets : { workload = k, secret = s }]]) :
    "${pair.workload}/${pair.secret}" => pair
  }
  secret_id = merge(
    google_secret_manager_secret.grant, google_secret_manager_secret.credential
  )[each.value.secret].id
  role   = "roles/secretmanager.secretAccessor"
  member = "serviceAccount:${google_service_account.workload[each.value.workload].email}"
}
