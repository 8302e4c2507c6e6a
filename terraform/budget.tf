# NFR-14: the budget and its alert exist before anything billable. Every billable resource of
# this configuration names google_billing_budget.dev in depends_on (tests/deploy checks it), so
# the first `terraform apply` creates the budget first and a failed budget stops the apply.
# Budgets are monthly: the amount is the daily cap x 31, with alerts at 1, 3 and 10 days' worth
# of the cap in the month, plus the forecast reaching the full amount.

resource "google_project_service" "billingbudgets" {
  service            = "billingbudgets.googleapis.com"
  disable_on_destroy = false
}

resource "google_project_service" "monitoring" {
  service            = "monitoring.googleapis.com"
  disable_on_destroy = false
}

resource "google_monitoring_notification_channel" "budget" {
  for_each     = toset(var.budget_alert_emails)
  display_name = "payouts dev budget: ${each.value}"
  type         = "email"
  labels       = { email_address = each.value }
  depends_on   = [google_project_service.monitoring]
}

data "google_project" "this" {
  project_id = var.project_id
}

resource "google_billing_budget" "dev" {
  billing_account = var.billing_account
  display_name    = "payouts-dev (${var.daily_cap_eur} EUR/day)"

  budget_filter {
    projects        = ["projects/${data.google_project.this.number}"]
    calendar_period = "MONTH"
  }

  amount {
    specified_amount {
      currency_code = "EUR"
      units         = tostring(var.daily_cap_eur * 31)
    }
  }

  threshold_rules { threshold_percent = 1 / 31 }
  threshold_rules { threshold_percent = 3 / 31 }
  threshold_rules { threshold_percent = 10 / 31 }
  threshold_rules {
    threshold_percent = 1.0
    spend_basis       = "FORECASTED_SPEND"
  }

  all_updates_rule {
    monitoring_notification_channels = [for c in google_monitoring_notification_channel.budget : c.id]
    disable_default_iam_recipients   = false
  }

  depends_on = [google_project_service.billingbudgets]
}
