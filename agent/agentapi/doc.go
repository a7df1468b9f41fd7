// Package agentapi is the host agent's contract: the bodies of its HTTP
// API (Inventory, EnsureVMM, VMMStatus, RegionSpec, Region, Mapping), the
// bodies it sends the control plane (Registration, Report), its error
// codes, and Client, the Go client of that API.
//
// It is what the control plane links of the agent: it imports the
// standard library, the instance contract (instance/apiv1) and the
// instance client (for its *client.APIError) only, never the agent
// itself, so the control plane does not link the data plane (eBPF,
// netlink), the downstairs or the VMM (internal/layering enforces this).
//
// A vmm's State and Gen in VMMStatus and Report are its instance's
// published view (apiv1.State, apiv1.ViewGen), relayed as the vmm
// published them; Inventory.Gen counts the agent's own inventory changes
// and is a different number.
package agentapi
