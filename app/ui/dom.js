// The one DOM builder of Lethe's pages (the dashboard and /verify): every value is inserted as
// text, never as HTML; SVG tags get the SVG namespace; onclick/onsubmit become listeners.
"use strict";

function el(tag, attrs = {}, ...children) {
  const svg = ["svg", "line", "polyline", "circle", "text", "rect", "g"].includes(tag);
  const node = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag)
                   : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined) continue;
    if (k === "onclick" || k === "onsubmit") node.addEventListener(k.slice(2), v);
    else if (k === "style") node.style.cssText = String(v);  // CSSOM: allowed by style-src 'self'
    else node.setAttribute(k, String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
