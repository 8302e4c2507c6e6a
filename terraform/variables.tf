variable "project_id" {
  description = "GCP project of the dev environment."
  type        = string
}

variable "billing_account" {
  description = "Billing account id (XXXXXX-XXXXXX-XXXXXX) the budget watches."
  type        = string
}

variable "region" {
  description = "The one region of every resource (A-11)."
  type        = string
  default     = "europe-central2"
  validation {
    condition     = var.region == "europe-central2"
    error_message = "The dev environment runs in europe-central2 only (A-11)."
  }
}

variable "daily_cap_eur" {
  description = "Stated daily cost cap of the dev environment (NFR-14), in EUR."
  type        = number
  default     = 15
}

variable "budget_alert_emails" {
  description = "Where budget alerts go (a Cloud Monitoring email channel each)."
  type        = list(string)
}
