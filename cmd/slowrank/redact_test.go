package main

import "testing"

func TestRedactEndpointHidesCredentials(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"http://collector:4318", "http://collector:4318"},
		{"https://user:s3cret@otlp.example:443/v1", "https://REDACTED@otlp.example:443/v1"},
		{"https://otlp.example/v1/traces?api_key=s3cret", "https://otlp.example/v1/traces?REDACTED"},
		{"collector:4318", "(set; not shown: not a URL)"},
		{"http://a b", "(set; not shown: not a URL)"},
	}
	for _, tc := range tests {
		if got := redactEndpoint(tc.in); got != tc.want {
			t.Errorf("redactEndpoint(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
