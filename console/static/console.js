// Asks before an action is posted. A button's data-confirm holds the question; the
// page's inline scripts are forbidden by its Content-Security-Policy, so this file
// is the only script.
document.addEventListener("click", function (event) {
  var button = event.target.closest("button[data-confirm]");
  if (button && !window.confirm(button.getAttribute("data-confirm"))) {
    event.preventDefault();
  }
});
