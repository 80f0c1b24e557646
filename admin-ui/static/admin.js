// laneway admin: the one script of our own (served from /admin/static, so the CSP stays 'self').
// Ask before a save that disables a tenant, and only then: the same form saves every limit,
// so a plain hx-confirm would ask on each save. Revoking a key uses hx-confirm on its form.
document.addEventListener("htmx:confirm", (event) => {
  const elt = event.detail.elt;
  const form = elt instanceof Element ? elt.closest("form[data-confirm-disable]") : null;
  if (!form) return;
  const box = form.querySelector("input[name=disabled]");
  if (!box || !box.checked || box.defaultChecked) return;
  event.preventDefault();
  if (window.confirm(form.dataset.confirmDisable)) event.detail.issueRequest(true);
});
