package uuidtext

import "testing"

func TestIs(t *testing.T) {
	for s, want := range map[string]bool{
		"6f1c7a4e-0b55-4a8e-9d0e-3f3f8c2a9b10": true,
		"6F1C7A4E-0B55-4A8E-9D0E-3F3F8C2A9B10": true,
		"legacy-000001":                        false,
		"6f1c7a4e0b554a8e9d0e3f3f8c2a9b10":     false,
		"6f1c7a4e-0b55-4a8e-9d0e-3f3f8c2a9b1g": false,
		"":                                     false,
	} {
		if Is(s) != want {
			t.Errorf("Is(%q) = %v", s, !want)
		}
	}
	if Lower("6F1C7A4E-0B55") != "6f1c7a4e-0b55" {
		t.Error("Lower")
	}
}
