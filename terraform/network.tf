# One VPC for GKE and Cloud SQL's private IP; nothing has a public address.
resource "google_compute_network" "vpc" {
  name                    = "payouts-dev"
  auto_create_subnetworks = false
  depends_on              = [google_billing_budget.dev, google_project_service.apis]
}

resource "google_compute_subnetwork" "gke" {
  name                     = "payouts-dev-gke"
  network                  = google_compute_network.vpc.id
  region                   = var.region
  ip_cidr_range            = "10.10.0.0/20"
  private_ip_google_access = true
  secondary_ip_range {
    range_name    = "pods"
    ip_cidr_range = "10.20.0.0/16"
  }
  secondary_ip_range {
    range_name    = "services"
    ip_cidr_range = "10.30.0.0/20"
  }
  log_config {
    aggregation_interval = "INTERVAL_10_MIN"
    flow_sampling        = 0.5
    metadata             = "INCLUDE_ALL_METADATA"
  }
  depends_on = [google_billing_budget.dev]
}

resource "google_compute_global_address" "sql_peering" {
  name          = "payouts-dev-sql-peering"
  purpose       = "VPC_PEERING"
  address_type  = "INTERNAL"
  prefix_length = 20
  network       = google_compute_network.vpc.id
  depends_on    = [google_billing_budget.dev]
}

resource "google_service_networking_connection" "sql" {
  network                 = google_compute_network.vpc.id
  service                 = "servicenetworking.googleapis.com"
  reserved_peering_ranges = [google_compute_global_address.sql_peering.name]
  depends_on              = [google_billing_budget.dev]
}

# Egress for image pulls of third-party images (Temporal Cloud, etcd, Cloud SQL proxy).
resource "google_compute_router" "nat" {
  name       = "payouts-dev"
  network    = google_compute_network.vpc.id
  region     = var.region
  depends_on = [google_billing_budget.dev]
}

resource "google_compute_router_nat" "nat" {
  name                               = "payouts-dev"
  router                             = google_compute_router.nat.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"
  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
  depends_on = [google_billing_budget.dev]
}

# Nothing enters the VPC from outside; GKE adds its own rules for the control plane.
resource "google_compute_firewall" "deny_ingress" {
  name          = "payouts-dev-deny-ingress"
  network       = google_compute_network.vpc.id
  direction     = "INGRESS"
  priority      = 65534
  source_ranges = ["0.0.0.0/0"]
  deny {
    protocol = "all"
  }
  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
  depends_on = [google_billing_budget.dev]
}
