package main

import (
	"fmt"
	"net"
	"strings"

	"tern/vmm"
)

// netFlagHelp is --net's help.
const netFlagHelp = "network card: tap:NAME, or tap:NAME,mac=52:54:00:xx:xx:xx (repeatable, at most 4; the MAC defaults to one derived from NAME)"

// parseNetFlags turns --net values into network cards; every bad value
// is reported.
func parseNetFlags(values []string) ([]vmm.NIC, error) {
	var nics []vmm.NIC
	var errs []string
	for _, v := range values {
		n, err := parseNetFlag(v)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		nics = append(nics, n)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nics, nil
}

// parseNetFlag parses one --net value: tap:NAME[,mac=MAC].
func parseNetFlag(v string) (vmm.NIC, error) {
	kind, rest, _ := strings.Cut(v, ":")
	if kind != "tap" {
		return vmm.NIC{}, fmt.Errorf("--net %q: want tap:NAME[,mac=MAC]", v)
	}
	fields := strings.Split(rest, ",")
	n := vmm.NIC{TAP: fields[0]}
	if n.TAP == "" {
		return vmm.NIC{}, fmt.Errorf("--net %q: no TAP name", v)
	}
	for _, opt := range fields[1:] {
		key, val, _ := strings.Cut(opt, "=")
		if key != "mac" || n.MAC != nil {
			return vmm.NIC{}, fmt.Errorf("--net %q: option %q: want one mac=MAC", v, opt)
		}
		mac, err := net.ParseMAC(val)
		if err != nil {
			return vmm.NIC{}, fmt.Errorf("--net %q: %w", v, err)
		}
		n.MAC = mac
	}
	return n, nil
}
