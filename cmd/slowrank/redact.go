package main

import "net/url"

// redactEndpoint returns an OTLP endpoint as /status may show it: without
// user information or query (either can carry a credential), which the
// status endpoint, served on the pod IP with metrics on, must never hand
// out. An endpoint that does not parse is withheld whole.
func redactEndpoint(endpoint string) string {
	if endpoint == "" {
		return ""
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "(set; not shown: not a URL)"
	}
	if u.User != nil {
		u.User = url.User("REDACTED")
	}
	if u.RawQuery != "" {
		u.RawQuery = "REDACTED"
	}
	u.Fragment = ""
	return u.String()
}
