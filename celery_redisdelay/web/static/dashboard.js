// The few things a page does better with a script; every page works without it.
"use strict";

// The overview's history charts follow what happens: the server draws the section again every few seconds.
const HISTORY_EVERY_MS = 10000;

function refreshHistory() {
  const section = document.getElementById("history");
  if (!section || document.hidden) return;
  fetch(section.dataset.refresh, { credentials: "same-origin", headers: { Accept: "text/html" } })
    .then((response) => (response.ok ? response.text() : Promise.reject(response.status)))
    .then((html) => {
      const fresh = document.createElement("div");
      fresh.innerHTML = html;
      const replacement = fresh.querySelector("#history");
      if (replacement) section.replaceWith(replacement);
    })
    .catch(() => {}); // Redis or the server is away: keep what is shown, try again next time
}

document.addEventListener("DOMContentLoaded", () => {
  if (document.getElementById("history")) setInterval(refreshHistory, HISTORY_EVERY_MS);
  for (const form of document.querySelectorAll("form.bulk")) {
    const boxes = () => [...form.querySelectorAll('input[name="ids"]')];
    const all = form.querySelector("[data-select-all]");
    const needs = form.querySelectorAll("[data-needs-selection]");
    const refresh = () => {
      const chosen = boxes().filter((box) => box.checked).length;
      for (const button of needs) {
        button.disabled = chosen === 0;
        button.textContent = chosen ? `Apply to ${chosen} selected` : "Apply to selected";
      }
      if (all) {
        all.checked = chosen > 0 && chosen === boxes().length;
        all.indeterminate = chosen > 0 && chosen < boxes().length;
      }
    };
    if (all) {
      all.addEventListener("change", () => {
        for (const box of boxes()) box.checked = all.checked;
        refresh();
      });
    }
    form.addEventListener("change", refresh);
    refresh();
  }
  // The reschedule fields only matter when the chosen action is a reschedule.
  for (const select of document.querySelectorAll("[data-action-select]")) {
    const fields = select.form.querySelector('[data-for-action="reschedule"]');
    if (!fields) continue;
    const show = () => fields.classList.toggle("hidden", select.value !== "reschedule");
    select.addEventListener("change", show);
    show();
  }
});
